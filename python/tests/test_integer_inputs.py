"""Integer inputs: every binding that takes integer arrays or sequences accepts any integer
dtype (int8..uint64) and Python ints, and refuses a value outside the C++ type's range with
a ValueError naming the argument, the index and the value; nothing is ever truncated."""

import re

import numpy as np
import pytest

import pagedkv as pk

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
NON_INT_DTYPES = [np.float32, np.float64, np.bool_, np.complex64]

# The C++ types of the inputs: TokenId, BlockId and counts are int32, SeqId int64, extra keys
# uint64 (include/pagedkv/types.h).
RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "uint64": (0, 2**64 - 1)}


def manager():
    return pk.KvCacheManager(layer_groups=pk.full_attention(8), block_size=2)


def running_manager():
    m = manager()
    m.add_sequence(1, [1, 2])
    m.allocate_slots(1, 2)
    return m


def running_hybrid():
    """A manager with a full and a sliding-window layer group, sequence 1 running."""
    m = pk.KvCacheManager(block_size=2, layer_groups=[
        pk.LayerGroup(num_blocks=8),
        pk.LayerGroup(kind=pk.AttentionKind.SLIDING_WINDOW, window=2, num_blocks=8)])
    m.add_sequence(1, [1, 2])
    m.allocate_slots(1, 2)
    return m


def pool():
    return pk.BlockPool(num_blocks=4, block_size=2)


def storage():
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=pk.DType.FLOAT32,
                          block_size=2)
    return pk.KvStorage(spec, 4, device=pk.Device.CPU)


H = pk.hash_block(None, [1, 2])

# (function, argument, C++ type, call with the values of that argument)
ENTRY_POINTS = [
    ("add_sequence", "prompt", "int32", lambda v: manager().add_sequence(1, v)),
    ("add_sequence", "extra_keys", "uint64",
     lambda v: manager().add_sequence(1, [1, 2], extra_keys=v)),
    ("append_tokens", "tokens", "int32", lambda v: running_manager().append_tokens(1, v)),
    ("append_tokens_batch", "seqs", "int64",
     lambda v: running_manager().append_tokens_batch(v, [3, 4])),
    ("append_tokens_batch", "tokens", "int32",
     lambda v: running_manager().append_tokens_batch([1], v, indptr=[0, 2])),
    ("append_tokens_batch", "indptr", "int32",
     lambda v: running_manager().append_tokens_batch([1], [3, 4], indptr=v)),
    ("allocate_slots_batch", "seqs", "int64",
     lambda v: running_manager().allocate_slots_batch(v, [0, 0])),
    # With out=, a count of 2**31 - 1 is refused before the C++ call sizes its slot buffer.
    ("allocate_slots_batch", "num_new_tokens", "int32",
     lambda v: running_manager().allocate_slots_batch([1, 1], v, out=np.zeros(4, np.int64))),
    ("build_block_tables", "seqs", "int64", lambda v: running_manager().build_block_tables(v)),
    ("write_block_tables", "seqs", "int64",
     lambda v: running_manager().write_block_tables(v, np.zeros((2, 4), np.int32),
                                                    np.zeros(2, np.int32))),
    ("write_csr_block_tables", "seqs", "int64",
     lambda v: running_manager().write_csr_block_tables(
         v, np.zeros(3, np.int32), np.zeros(8, np.int32), np.zeros(2, np.int32))),
    # The same calls on a layer group other than 0, and the batched call's group slots.
    ("build_block_tables", "seqs", "int64",
     lambda v: running_hybrid().build_block_tables(v, group=1)),
    ("write_block_tables", "seqs", "int64",
     lambda v: running_hybrid().write_block_tables(v, np.zeros((2, 4), np.int32),
                                                   np.zeros(2, np.int32), group=1)),
    ("write_csr_block_tables", "seqs", "int64",
     lambda v: running_hybrid().write_csr_block_tables(
         v, np.zeros(3, np.int32), np.zeros(8, np.int32), np.zeros(2, np.int32), group=1)),
    ("allocate_slots_batch", "num_new_tokens", "int32",
     lambda v: running_hybrid().allocate_slots_batch([1, 1], v, out=np.zeros(4, np.int64))),
    ("free", "blocks_in_eviction_order", "int32", lambda v: pool().free(v)),
    ("find_cached", "tokens", "int32", lambda v: pool().find_cached(H, -1, v)),
    ("find_cached", "extra_keys", "uint64",
     lambda v: pool().find_cached(H, -1, [1, 2], extra_keys=v)),
    ("cache_full_block", "tokens", "int32",
     lambda v: pool().cache_full_block(0, H, -1, None, v)),
    ("cache_full_block", "extra_keys", "uint64",
     lambda v: pool().cache_full_block(0, H, -1, None, [1, 2], extra_keys=v)),
    ("hash_block", "tokens", "int32", lambda v: pk.hash_block(None, v)),
    ("hash_block", "extra_keys", "uint64", lambda v: pk.hash_block(None, [1, 2], extra_keys=v)),
]
ENTRY_IDS = [f"{function}-{argument}" for function, argument, _, _ in ENTRY_POINTS]


def range_message(function, argument, index, value, ctype):
    low, high = RANGES[ctype]
    return re.escape(f"{function}: {argument}{index} = {value} is outside the {ctype} range "
                     f"[{low}, {high}]")


def call_accepts(call, values):
    """The call took the values: it may fail for its own reasons (an unknown id, a bad
    count), never for the range or the type of its integers."""
    try:
        call(values)
    except (ValueError, KeyError, IndexError, RuntimeError) as error:
        assert "is outside the" not in str(error)


def limits(ctype, dtype):
    """(values at the limits, values one beyond) that the dtype can represent."""
    low, high = RANGES[ctype]
    info = np.iinfo(dtype)
    at = [max(low, int(info.min)), min(high, int(info.max))]
    beyond = [value for value in (low - 1, high + 1) if info.min <= value <= info.max]
    return at, beyond


@pytest.mark.parametrize("function, argument, ctype, call", ENTRY_POINTS, ids=ENTRY_IDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_an_integer_array_of_any_dtype_is_accepted_at_the_limits_and_refused_beyond(
        function, argument, ctype, call, dtype):
    at, beyond = limits(ctype, dtype)
    for value in at:
        call_accepts(call, np.array([1, value], dtype))
        call_accepts(call, np.array([1, 9, value], dtype)[::2])  # strided: copied, checked
    for value in beyond:
        with pytest.raises(ValueError, match=range_message(function, argument, "[1]", value,
                                                           ctype)):
            call(np.array([1, value], dtype))


@pytest.mark.parametrize("function, argument, ctype, call", ENTRY_POINTS, ids=ENTRY_IDS)
def test_python_ints_are_accepted_at_the_limits_and_refused_beyond(function, argument, ctype,
                                                                   call):
    low, high = RANGES[ctype]
    for value in (low, high):
        call_accepts(call, [1, value])
        call_accepts(call, (1, np.int64(value) if ctype == "int32" else value))
    for value in (low - 1, high + 1, 2**70, -2**70):
        with pytest.raises(ValueError, match=range_message(function, argument, "[1]", value,
                                                           ctype)):
            call([1, value])


@pytest.mark.parametrize("function, argument, ctype, call", ENTRY_POINTS, ids=ENTRY_IDS)
@pytest.mark.parametrize("dtype", NON_INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_non_integer_arrays_and_floats_are_refused_with_type_error(function, argument, ctype,
                                                                   call, dtype):
    with pytest.raises(TypeError):
        call(np.array([1, 1], dtype))
    with pytest.raises(TypeError):
        call([1, 1.0])


def test_one_count_for_all_is_range_checked():
    with pytest.raises(ValueError, match=range_message("allocate_slots_batch", "num_new_tokens",
                                                       "", 2**31, "int32")):
        running_manager().allocate_slots_batch([1], 2**31)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_copy_ops_arrays_of_any_integer_dtype_are_range_checked(dtype):
    s = storage()
    s.copy_blocks(np.array([[0, 1, 2]], dtype))
    s.copy_blocks(np.array([[0, 9, 1, 9, 2, 9]], dtype)[:, ::2])  # strided
    _, beyond = limits("int32", dtype)
    for value in beyond:
        with pytest.raises(ValueError, match=range_message("copy_blocks", "ops", "[0, 1]", value,
                                                           "int32")):
            s.copy_blocks(np.array([[0, value, 2]], dtype))
    with pytest.raises(TypeError, match="copy_blocks: ops is not an integer array"):
        s.copy_blocks(np.array([[0, 1, 2]], np.float32))


# --- the outside tester's reproducers ------------------------------------------------------

def test_int64_token_ids_beyond_int32_are_refused_not_truncated():
    m = manager()
    with pytest.raises(ValueError, match=range_message("add_sequence", "prompt", "[0]",
                                                       2**32 + 7, "int32")):
        m.add_sequence(1, np.array([2**32 + 7] * 5, np.int64))
    assert 1 not in m  # nothing changed


def test_hash_block_of_int64_tokens_beyond_int32_is_refused():
    with pytest.raises(ValueError, match=range_message("hash_block", "tokens", "[0]", 2**32 + 5,
                                                       "int32")):
        pk.hash_block(None, np.array([2**32 + 5] * 4, np.int64))


def test_no_false_prefix_hit_from_truncated_tokens():
    m = pk.KvCacheManager(layer_groups=pk.full_attention(16), block_size=4)
    with pytest.raises(ValueError):
        m.add_sequence(1, np.array([2**32 + 7] * 9, np.int64))
    m.add_sequence(3, [2**31 - 1] * 9)  # the largest token id is kept as it is
    assert list(m.sequence(3).tokens) == [2**31 - 1] * 9
    m.allocate_slots(3, 9)
    m.free(3)
    m.add_sequence(2, [7] * 9)
    assert m.match_prefix(2) == 0


def test_a_layer_group_argument_is_an_int32_in_range():
    m = running_hybrid()
    for call in (lambda g: m.slot_mapping(g), lambda g: m.batch_slot_mapping(g),
                 lambda g: m.group_stats(g), lambda g: m.layer_group(g),
                 lambda g: m.sequence(1, g), lambda g: m.build_block_tables([1], group=g)):
        with pytest.raises(TypeError):  # beyond int32: nanobind's conversion
            call(2**31)
        with pytest.raises(TypeError):
            call(1.0)
        with pytest.raises(ValueError, match=re.escape("layer group 2 outside [0, 2)")):
            call(2)
        with pytest.raises(ValueError, match=re.escape("layer group -2147483648 outside [0, 2)")):
            call(-2**31)
