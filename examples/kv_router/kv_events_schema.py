"""The KV event wire schema (docs/events.md), as msgspec structs.

Field for field the schema of vLLM 0.33.0 (vllm/distributed/kv_events.py), written out
here so that a router needs neither vLLM nor pagedkv to decode the events: a batch is a
msgpack array [ts, events, data_parallel_rank]; each event a msgpack map tagged by its
"type" key. Decoding with these types checks every field's type.
"""

from typing import Any

import msgspec

# A block hash as sent: bytes (pagedkv: 16 bytes, the XXH3-128 canonical form), or an int
# from vLLM engines run with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES.
ExternalBlockHash = bytes | int

# vLLM's KVCacheSpecKind values (vllm/v1/kv_cache_interface.py, a str enum): what
# BlockStored.kv_cache_spec_kind holds. pagedkv sends the first three (docs/events.md,
# "Layer groups").
KV_CACHE_SPEC_KINDS = frozenset({
    "full_attention", "sliding_window", "chunked_local_attention", "mla_attention",
    "sliding_window_mla", "mamba", "sink_full_attention", "encoder_only_attention",
    "cross_attention", "unknown"})

# Sequence number of the END marker closing a replay or snapshot reply.
END_SEQ = -1
# Request payload asking the ROUTER socket for a snapshot (pagedkv's addition).
SNAPSHOT_REQUEST = -2


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the events; encoded as a map whose "type" key names the class."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


decoder = msgspec.msgpack.Decoder(KVEventBatch)


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)
