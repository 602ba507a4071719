#!/usr/bin/env python3
"""Unit test of the reference router's per-medium and per-layer-group index
(examples/kv_router/kv_router.py): events decoded from the wire schema, exact expected
entries, prefixes and scores; a hybrid model's prefix under its hit rule.
usage: kv_router_index_test.py ROUTER_DIR
"""

import sys

sys.path.insert(0, sys.argv[1])
import kv_events_schema as schema  # noqa: E402
import kv_router  # noqa: E402

BS = 2
GPU, CPU = kv_router.DEVICE_MEDIUM, kv_router.HOST_MEDIUM
A, B, C = b"\xaa" * 16, b"\xbb" * 16, b"\xcc" * 16
TOKENS = [1, 2, 3, 4, 5, 6]  # blocks A = [1, 2], B = [3, 4], C = [5, 6]
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def stored(hashes, parent, tokens, medium, group=None, kind=None, window=None):
    return schema.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                              block_size=BS, lora_id=None, medium=medium, lora_name=None,
                              group_idx=group, kv_cache_spec_kind=kind,
                              kv_cache_spec_sliding_window=window)


def removed(hashes, medium, group=None):
    return schema.BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group)


def apply(index, *events):
    # Through the wire: encode as the engine would, decode as the router does.
    payload = schema.msgspec.msgpack.encode(schema.KVEventBatch(ts=0.0, events=list(events)))
    index.apply(schema.decoder.decode(payload))


index = kv_router.EngineIndex()
apply(index, stored([A, B, C], None, TOKENS, GPU))
check(index.entries() == sorted(f"{h.hex()} GPU" for h in (A, B, C)), "three device blocks")
check(index.prefix_blocks(TOKENS + [0], BS) == 3, "prefix of 3 blocks")
check(index.prefix_score(TOKENS + [0], BS) == 3.0, "score 3 (all on the device)")

# C is evicted and demoted to the host tier: still a prefix hit, worth HOST_HIT_WEIGHT.
apply(index, removed([C], GPU), stored([C], B, [5, 6], CPU))
check(index.entries() == sorted([f"{A.hex()} GPU", f"{B.hex()} GPU", f"{C.hex()} CPU"]),
      "C moved to the host tier")
check(index.prefix_media(TOKENS, BS) == [{GPU}, {GPU}, {CPU}], "media along the prefix")
check(index.prefix_blocks(TOKENS, BS) == 3, "a host block still extends the prefix")
check(abs(index.prefix_score(TOKENS, BS) - (2 + kv_router.HOST_HIT_WEIGHT)) < 1e-12,
      f"score 2 + {kv_router.HOST_HIT_WEIGHT}")
check(index.prefix_score(TOKENS, BS, host_weight=0.0) == 2.0, "host weight 0: device only")

# B is stored on the host before it leaves the device: both media hold it for a moment.
apply(index, stored([B], A, [3, 4], CPU))
check(index.prefix_media(TOKENS, BS)[1] == {GPU, CPU}, "B held by both media")
check(len(index.entries()) == 4, "four (block, medium) entries")
apply(index, removed([B], GPU))
check(index.prefix_media(TOKENS, BS) == [{GPU}, {CPU}, {CPU}], "B on the host only")

# A removal from a medium that does not hold the block changes nothing; an event without a
# medium is a device event (vLLM before media).
apply(index, removed([A], CPU))
check(index.prefix_blocks(TOKENS, BS) == 3, "removing A from the host: no change")
apply(index, removed([A], None))
check(index.prefix_blocks(TOKENS, BS) == 0, "A gone: no prefix from the first block on")
check(sorted(index.entries()) == sorted([f"{B.hex()} CPU", f"{C.hex()} CPU"]),
      "B and C stay in the host tier")

# C promoted back (host -> device), then the host tier drops B; then a flush.
apply(index, removed([C], CPU), stored([C], B, [5, 6], GPU), removed([B], CPU))
check(index.entries() == [f"{C.hex()} GPU"], "C on the device, B dropped")
apply(index, schema.AllBlocksCleared())
check(index.entries() == [] and index.by_content == {}, "AllBlocksCleared empties every medium")

# Two engines: a longer prefix in the host tier beats a shorter one on the device, unless
# the host weight says otherwise.
device_short, host_long = kv_router.EngineIndex(), kv_router.EngineIndex()
apply(device_short, stored([A, B], None, TOKENS[:4], GPU))
apply(host_long, stored([A], None, TOKENS[:2], GPU), stored([B, C], A, TOKENS[2:], CPU))
check(device_short.prefix_score(TOKENS, BS) == 2.0, "device engine: score 2")
check(abs(host_long.prefix_score(TOKENS, BS) - (1 + 2 * kv_router.HOST_HIT_WEIGHT)) < 1e-12,
      "host engine: score 1 + 2 x weight (> 2)")
check(host_long.prefix_score(TOKENS, BS, host_weight=0.25) == 1.5, "weight 0.25: score 1.5")

# --- a hybrid model: a full group 0 and a sliding-window group 1 (window 4 tokens) --------
FULL = dict(group=0, kind="full_attention")
SWA = dict(group=1, kind="sliding_window", window=4)
hybrid = kv_router.EngineIndex()
apply(hybrid, stored([A, B, C], None, TOKENS, GPU, **FULL), stored([A, B, C], None, TOKENS, GPU, **SWA))
check(hybrid.hybrid and hybrid.specs == {0: ("full_attention", None), 1: ("sliding_window", 4)},
      "group kinds and windows learnt from the events")
check(hybrid.entries() == sorted(f"{h.hex()} GPU {g}" for h in (A, B, C) for g in (0, 1)),
      "entries name the group: one per block, group and medium")
check(hybrid.prefix_blocks(TOKENS + [0], BS) == 3, "hybrid: 3 blocks, every group holds them")

# Group 1 evicts A (released behind the window): a 3-block hit needs only blocks 1 and 2 of
# the window group (the token at position 6 attends to 3..6), so the hit stands.
apply(hybrid, removed([A], GPU, group=1))
check(hybrid.prefix_blocks(TOKENS + [0], BS) == 3, "A gone from the window group: still 3")
check(hybrid.prefix_blocks(TOKENS[:4] + [0], BS) == 0,
      "a 2-block prefix needs A in the window group (position 4 attends to 1..4): 0")
# C demoted to group 1's host tier: a hit, worth the host weight for that block.
apply(hybrid, removed([C], GPU, group=1), stored([C], B, [5, 6], CPU, **SWA))
check(hybrid.prefix_media(TOKENS, BS) == [{GPU}, {GPU}, {CPU}],
      "block 2 needs the window group's host copy")
check(abs(hybrid.prefix_score(TOKENS, BS) - (2 + kv_router.HOST_HIT_WEIGHT)) < 1e-12,
      "score 2 + host weight")
# C leaves group 1: the hit falls back to 2 blocks, which need A there: none at all.
apply(hybrid, removed([C], CPU, group=1))
check(hybrid.prefix_blocks(TOKENS + [0], BS) == 0, "C gone from the window group: no hit")
check(hybrid.entries() == sorted([f"{A.hex()} GPU 0", f"{B.hex()} GPU 0", f"{C.hex()} GPU 0",
                                  f"{B.hex()} GPU 1"]), "what is left, per group")
# Group 0 is unaffected by group 1's removals, and the reverse.
apply(hybrid, removed([B], GPU, group=0))
check(hybrid.groups[1].media == {B: {GPU}}, "a removal in group 0 leaves group 1's B")
apply(hybrid, schema.AllBlocksCleared())
check(hybrid.entries() == [], "AllBlocksCleared empties every group")

# A chunked-local group: vLLM sends no chunk size, so without one from the model's config
# the group counts as full (it must hold every block); with chunk 4 a 3-block hit (position
# 6, chunk [4, 8)) needs its block 2 only.
CHUNK = dict(group=1, kind="chunked_local_attention")
for chunk_sizes, expected in [(None, 0), ({1: 4}, 3)]:
    idx = kv_router.EngineIndex(chunk_sizes)
    apply(idx, stored([A, B, C], None, TOKENS, GPU, **FULL), stored([C], B, [5, 6], GPU, **CHUNK))
    check(idx.prefix_blocks(TOKENS + [0], BS) == expected,
          f"chunked group, chunk sizes {chunk_sizes}: {expected} blocks")

# A state group (mamba: state-space layers): its BlockStored of block i is a checkpoint of
# the state after it, so a hit of p blocks needs block p - 1 there and nothing else.
STATE = dict(group=1, kind="mamba")
ssm = kv_router.EngineIndex()
apply(ssm, stored([A, B, C], None, TOKENS, GPU, **FULL), stored([B], A, [3, 4], GPU, **STATE))
check(ssm.prefix_blocks(TOKENS + [0], BS) == 2,
      "state group: the hit ends at its checkpoint after B (2 blocks), not at C")
check(ssm.prefix_media(TOKENS + [0], BS) == [{GPU}, {GPU}], "media of the checkpointed prefix")
apply(ssm, stored([A], None, [1, 2], GPU, **STATE), removed([B], GPU, group=1))
check(ssm.prefix_blocks(TOKENS + [0], BS) == 1, "B's checkpoint evicted: the one after A, 1")
apply(ssm, removed([A], GPU, group=1))
check(ssm.prefix_blocks(TOKENS + [0], BS) == 0, "no checkpoint left: no hit")

check(kv_router.FULL_KINDS | kv_router.SLIDING_KINDS | {kv_router.CHUNKED_KIND, kv_router.STATE_KIND}
      <= schema.KV_CACHE_SPEC_KINDS, "the router's kinds are vLLM's KVCacheSpecKind values")

# Through the wire: the group fields survive msgspec's strict decoding.
payload = schema.msgspec.msgpack.encode(schema.KVEventBatch(ts=0.0, events=[
    stored([A], None, [1, 2], GPU, **SWA), removed([A], GPU, group=1)]))
decoded = schema.decoder.decode(payload).events
check((decoded[0].group_idx, decoded[0].kv_cache_spec_kind,
       decoded[0].kv_cache_spec_sliding_window, decoded[1].group_idx) ==
      (1, "sliding_window", 4, 1), "group_idx, kind and window decoded")

if failures:
    print(f"FAIL: {len(failures)} check(s)")
    sys.exit(1)
print("PASS")
